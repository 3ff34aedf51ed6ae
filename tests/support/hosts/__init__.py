"""Hosts of their own for the tests (network namespaces on this machine): the cluster, a
processor whose workers run on its hosts, the nemesis that cuts links, and its soak."""
