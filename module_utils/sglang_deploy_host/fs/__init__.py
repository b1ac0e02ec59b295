"""Files and filesystems on a host: bounded reads of regular files, paths root may act on, block devices."""
