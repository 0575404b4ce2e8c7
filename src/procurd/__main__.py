from procurd.cli import main

main()
