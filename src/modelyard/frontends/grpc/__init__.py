"""The KServe v2 (Open Inference Protocol) gRPC front end."""
