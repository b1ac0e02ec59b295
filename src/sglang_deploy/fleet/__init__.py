"""Several workers behind the router: the router resolved once and its flags judged by its pinned parser."""
