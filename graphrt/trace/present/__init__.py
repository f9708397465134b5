"""What `graphrt analyze` prints and draws: its tables, JSON and the step picture."""
