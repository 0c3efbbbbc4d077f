"""The numerics of the model a worker trains: building it (base and LoRA), attention over packed rows, the loss,
mixed precision.
"""
