CREATE OR REPLACE FUNCTION public.lock_wait_to_nodes()
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    EXECUTE format('SET LOCAL lock_timeout = %L', current_setting('lock_timeout'));
END
$function$;
