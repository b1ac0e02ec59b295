"""Watching a serving host: the watchdog's data (``model``) and what one tick observes (``observe``); the
program itself is the package's ``watchdog``, which the watchdog unit runs. Also the Prometheus file_sd targets."""
