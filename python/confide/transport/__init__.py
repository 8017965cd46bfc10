"""gRPC transport: mTLS identities, message pool, slicing and the aggregator/relay services."""
