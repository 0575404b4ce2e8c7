"""The catalogue mirror: upstream categories, products and SKUs copied into ``mirror_*`` tables, with
selling prices.

:mod:`procurd.core.catalog` decides what changes and which pass to run, :mod:`procurd.core.pricing` what
things sell for (both free of I/O); :mod:`procurd.catalog.sync` runs a pass
(:func:`procurd.catalog.sync.run_sync`), :mod:`procurd.catalog.pricing` reprices and handles holds;
statements live in :mod:`procurd.db.mirror_store`.
"""
