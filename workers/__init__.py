"""What runs studies and trials: tasks, the distributed training loop, the dispatcher."""
