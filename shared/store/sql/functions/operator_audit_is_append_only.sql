CREATE OR REPLACE FUNCTION public.operator_audit_is_append_only()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the operator audit trail is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$function$;
