"""procurd as the upstream of other sites (the provider role), in one place:

* :mod:`~procurd.provider.backend`: the provider's side of the signed API, which the public listener serves
  (:mod:`procurd.http.provider`); it opens no transaction;
* :mod:`~procurd.provider.operations`: every provider operation (the offered catalogue's pages, orders from
  downstream sites, their cancels, callbacks replayed, the checks behind its alerts), as the signed API, the
  admin API, the console and the command line reach it;
* :mod:`~procurd.provider.accounts`: accounts and wallets;
* :mod:`~procurd.provider.catalog`: the offered catalogue kept in step with the mirror;
* :mod:`~procurd.provider.pages`: the listing pages kept in memory;
* :mod:`~procurd.provider.callbacks`: the callbacks to downstream sites and their dispatcher;
* :mod:`~procurd.provider.ports`: what the installation gives the role.

A provider order is checked, priced, charged and taken in by the one state path, in one transaction
(:mod:`procurd.procurement.provider_orders`); storage is :mod:`procurd.db.provider_store` and
:mod:`procurd.db.offered_store`; the pure rules are :mod:`procurd.core.provider`; the wire is
:mod:`procurd.protocol.dujiao`."""
