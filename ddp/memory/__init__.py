"""What a wrapper holds in memory, by part (the accounting every strategy reports), and FSDP2's gathered memory."""
