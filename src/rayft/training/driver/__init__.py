"""The driver side of a training run: sequencing a run, planning it, and starting its workers (Ray Train, in-
process, torchrun).
"""
