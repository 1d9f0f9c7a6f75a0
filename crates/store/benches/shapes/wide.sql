WITH next AS (SELECT id FROM wjobs WHERE state='queued' AND pool='p' ORDER BY enqueued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED),
 j AS (UPDATE wjobs SET state='running', runner_id=:client_id, lease_deadline=1, started_at=1, history = wjobs.history || '{"at":1,"state":"running"}', version=wjobs.version+2 FROM next WHERE wjobs.id=next.id RETURNING wjobs.id)
UPDATE runners SET state='busy', job_id=j.id, version=runners.version+1 FROM j WHERE runners.id=:client_id+1;
WITH j AS (UPDATE wjobs SET state='completed', lease_deadline=NULL, finished_at=2, conclusion='success', history = wjobs.history || '{"at":2,"state":"completed"}', version=wjobs.version+1
   WHERE id=(SELECT job_id FROM runners WHERE id=:client_id+1) AND state='running' RETURNING id)
UPDATE runners SET state='idle', job_id=NULL, version=runners.version+1 FROM j WHERE runners.id=:client_id+1;
