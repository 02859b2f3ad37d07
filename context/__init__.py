"""Agent profiles (B1) and the context pipeline that assembles every block under a token budget; the
context inspector in the admin."""
