"""The demo's job scheduler and the routing of library logs to files."""
