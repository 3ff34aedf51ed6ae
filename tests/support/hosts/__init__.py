"""Hosts of their own for the tests (network namespaces on this machine): the cluster, a
processor whose workers run on its hosts, a Spark standalone cluster across them, the store
on FoundationDB on a host of its own, the nemesis that cuts links, its soak, and the
interpreter of its own that a run reading a store on a host needs (``apart``)."""
