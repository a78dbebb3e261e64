"""The training program: TrainingInstance, its compilation to the shared problem IR, the exact
solve with its bounds (Lagrangian, decomposition), the greedy allocators and their checks."""
