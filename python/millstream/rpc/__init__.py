"""GetRows over gRPC: the generated code, the mapper's server and the reducer's client."""
