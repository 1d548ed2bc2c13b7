"""What is being planned: the model, the hardware, the parallel layout and the software stack, as frozen specs."""
