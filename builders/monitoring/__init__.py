"""Production monitoring: the acceptance baseline measured at build time, Prometheus rules and the Grafana
dashboard (docs/production-metrics.md)."""
