"""Dollar budgets of `pyrodash serve`: config, the spend pacer, the shared store, the server hooks."""
