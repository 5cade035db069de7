"""Kubernetes manifests for one build config (`eagle-k8s CONFIG`, docs/deploy.md "Kubernetes")."""
