"""The FUSE mount of a storage root at /ctx (SPEC F-1): ``ctx mount`` serves it, and an agent
terminal serves each agent's own view of it."""
