"""Deployment targets: what runs a served model somewhere other than `hybridrt serve`.

- aws_lambda: the AWS Lambda handler (one request per invocation, runtime only);
- lambda_package: `hybridrt package-lambda`, the zip or container image that holds it;
- triton: `hybridrt triton`, a Triton Inference Server model repository (onnxruntime backend);
- ray_serve: `hybridrt serve --ray`, the server's replicas on a Ray cluster, each request routed to
  the replica holding its conversation's states.

The Kubernetes manifests live in the repository's deploy/ folder. Each target reuses the
server's OpenAI layer (hybridrt.serve) rather than a copy of it.
"""
