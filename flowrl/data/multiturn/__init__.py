"""What a multi-turn rollout talks to: environments, chat tools, tool-call formats."""
