-- Latest record per event_id; event types normalised; timestamps typed.
SELECT event_id, user_id, event_type, event_ts, country, device
FROM (
  SELECT
    event_id,
    user_id,
    lower(event_type) AS event_type,
    CAST(event_ts AS TIMESTAMP) AS event_ts,
    coalesce(country, 'unknown') AS country,
    device,
    row_number() OVER (PARTITION BY event_id ORDER BY _ingested_at DESC, _source_file DESC) AS rn
  FROM bronze.user_events
  WHERE event_id IS NOT NULL
) AS ranked
WHERE rn = 1
