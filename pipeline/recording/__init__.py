"""Recording: how a simulator's calls (start, actions, rewards, end) become step-table rows, the
same rows whichever mode the calls come in."""
