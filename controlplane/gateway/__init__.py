"""The worker-gateway: what a GPUStack server runs to read its Kubernetes clusters (docs/gateway.md)."""
