"""The catalogue mirror: upstream categories, products and SKUs copied into ``mirror_*`` tables.

``procurd.catalog.diff`` decides what changes (no I/O); ``procurd.catalog.sync`` runs a sync pass
(:func:`procurd.catalog.sync.run_sync`); statements live in ``procurd.db.mirror_store``.
"""
