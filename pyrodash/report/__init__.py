"""Reports: metrics, tables and plots computed from stored evaluation records only."""
