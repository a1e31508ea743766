"""Generated protobuf and gRPC modules of the KServe v2 API (scripts/gen_proto.sh)."""
