"""Export of checkpoints to standard Hugging Face model directories, verified before they count."""
