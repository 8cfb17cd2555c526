-- Seed 002's daily roll-up (incremental: over the silver rows of the days that changed).
SELECT
  CAST(event_ts AS DATE) AS event_date,
  COUNT(*) AS total_events,
  COUNT(DISTINCT user_id) AS unique_users
FROM silver.user_events
GROUP BY CAST(event_ts AS DATE)
