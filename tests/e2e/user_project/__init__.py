"""End-to-end tests of a user's own project (examples/user_project) trained from its own folder."""
