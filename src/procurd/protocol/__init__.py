"""The wire: every protocol procurd speaks, one folder per dialect, each with all of its halves.

- :mod:`procurd.protocol.dujiao`: Dujiao-Next's signed site-to-site API (seed 000), as a client of an
  upstream and as the server procurd's provider and sandbox answer with;
- :mod:`procurd.protocol.acgfaka`: acg-faka's shared-shop API, as a buyer.

Shared by them: :mod:`.web` (request bodies read within bounds, JSON answers), :mod:`.headers` (the HTTP
headers a client reads beside the body), :mod:`.destinations` (connections to an address a remote party
names: public addresses only). What every dialect's client raises and how it is budgeted is the upstream
interface, :mod:`procurd.upstream`.
"""
