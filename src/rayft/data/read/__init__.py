"""Reading datasets: where a dataset's rows are (:mod:`~rayft.data.read.sources`: local files, URIs,
the Hugging Face Hub, built-in sets) and the one reader of them, a row at a time
(:mod:`~rayft.data.read.rows`: :func:`~rayft.data.read.rows.iter_rows` and its record,
:class:`~rayft.data.read.rows.ReadRow`).
"""
