"""The ``rayft run`` pipeline: stage planning, fingerprints, lineage and the HTML report."""
