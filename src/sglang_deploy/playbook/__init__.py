"""Running the project's playbooks (ansible-runner, the live view, the recap) and the inventory's variables
against the roles' own."""
