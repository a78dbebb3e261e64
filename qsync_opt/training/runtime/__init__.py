"""Running a training plan: the launcher (torchrun-compatible), the trainer loop and the rank worker."""
