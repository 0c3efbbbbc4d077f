"""One recipe per command (``rayft train``, ``tune``, ``sdg``, ``eval``, ``compare``, ``export``,
``generate``, ``chat``): each ``run(cfg) -> Result`` reads top to bottom and only sequences the work of
the capability packages below it; no library module imports a recipe."""
