"""Running rayft on a Ray cluster that is already up: addresses, probes, and Ray Jobs."""
