"""What a run is fed: the bundled test set, random feeds, and a user's own arrays and images."""
