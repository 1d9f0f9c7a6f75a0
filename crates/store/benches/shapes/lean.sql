WITH next AS (SELECT id FROM ljobs WHERE state='queued' AND pool='p' ORDER BY enqueued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED),
 j AS (UPDATE ljobs SET state='running', runner_id=:client_id, lease_deadline=1, started_at=1, version=ljobs.version+2 FROM next WHERE ljobs.id=next.id RETURNING ljobs.id)
UPDATE runners SET state='busy', job_id=j.id, version=runners.version+1 FROM j WHERE runners.id=:client_id+1;
WITH d AS (DELETE FROM ljobs WHERE id=(SELECT job_id FROM runners WHERE id=:client_id+1) AND state='running' RETURNING *),
 h AS (INSERT INTO ldone SELECT id, pool, labels, payload, enqueued_at, started_at, 2, 'success' FROM d RETURNING id)
UPDATE runners SET state='idle', job_id=NULL, version=runners.version+1 FROM h WHERE runners.id=:client_id+1;
