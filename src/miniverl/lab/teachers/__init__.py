"""The lab's teachers: the oracle teacher, teacher fitting (toy, HF adapter, DAgger), the gate and audit."""
