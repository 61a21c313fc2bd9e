"""The tuning engine: job kinds (algorithms as the job runner drives them), hardware platforms, the tuners
themselves and the hardware descriptions. It depends on the domain models only: no Celery, HTTP or store
(the workers turn what a kind returns into store rows; the API asks `admission` what it accepts)."""
