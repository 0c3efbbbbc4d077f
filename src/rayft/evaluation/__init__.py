"""Evaluation of language models: tasks, metrics, intervals, paired tests, reports."""
