"""How workers share the model (``train.strategy``): DDP and FSDP, DeepSpeed ZeRO-3, the table between them, and
the memory check.
"""
