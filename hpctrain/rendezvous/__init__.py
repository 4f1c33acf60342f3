"""From a launcher's environment (torchrun's or srun's) to a joined process group on the right device."""
