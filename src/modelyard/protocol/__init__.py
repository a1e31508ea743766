"""Open Inference Protocol (KServe v2) data: datatypes, tensors, requests."""
