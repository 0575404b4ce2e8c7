"""The catalogue mirror: upstream categories, products and SKUs copied into ``mirror_*`` tables, with
selling prices.

:mod:`procurd.core.catalog` decides what changes and which pass to run, :mod:`procurd.core.listing` keeps a
pass's bookkeeping (what was listed, completeness, removals), :mod:`procurd.core.pricing` says what things
sell for (all free of I/O). Here: a pass as orchestration (:func:`procurd.catalog.sync.run_pass`) over its
fetch pipeline (:mod:`~procurd.catalog.fetch`), page memory (:mod:`~procurd.catalog.pages`) and lease
(:mod:`~procurd.catalog.lease`), and repricing (:mod:`~procurd.catalog.pricing`); both store through the
ports of :mod:`procurd.catalog.ports`, which :mod:`procurd.operations.catalog_pass` implements on the
database (statements live in :mod:`procurd.db.mirror_store`).
"""
