"""procurd as the upstream of other sites (the provider role): the offered catalogue, the callbacks to
downstream sites. Its orders go through the one state path (:mod:`procurd.procurement.transitions`), its
operations are :mod:`procurd.operations.provider`, its API is :mod:`procurd.http.provider`."""
