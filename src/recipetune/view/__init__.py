"""The terminal views of a campaign: the live trial table (live.py) and the campaign commands that run
under it (campaign.py: `tune`, `finetune`). A peer of report/: it reads the jobs, no job reads it."""
