// A real OpenID provider for oncepay's tests: oidc-provider (npm), configured from the environment,
// listening on loopback. Started by the tests (oncepay_devkit::oidc); nothing here is a mock.
//
//   OIDC_PORT     the port
//   OIDC_ISSUER   the issuer it names itself with (default http://127.0.0.1:$OIDC_PORT)
//   OIDC_CLIENTS  a JSON array of clients: [{"client_id", "client_secret", "redirect_uris": [...]}]
//
// Anyone signs in with any name at its login page (oidc-provider's development login); the name
// is the account's `sub`. Its clients are first-party: consent is granted without asking.
import Provider from 'oidc-provider';

const port = Number(process.env.OIDC_PORT);
const issuer = process.env.OIDC_ISSUER || `http://127.0.0.1:${port}`;
const clients = JSON.parse(process.env.OIDC_CLIENTS || '[]').map((client) => ({
  grant_types: ['authorization_code'],
  response_types: ['code'],
  token_endpoint_auth_method: 'client_secret_basic',
  ...client,
}));

const provider = new Provider(issuer, {
  clients,
  cookies: { keys: [process.env.OIDC_COOKIE_KEY || 'oncepay-tests-only'] },
  pkce: { required: () => true },
  async findAccount(ctx, sub) {
    return { accountId: sub, async claims() { return { sub, name: sub }; } };
  },
  async loadExistingGrant(ctx) {
    const existing = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (existing) {
      return ctx.oidc.provider.Grant.find(existing);
    }
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid profile');
    await grant.save();
    return grant;
  },
});
provider.proxy = false;

const server = provider.listen(port, '127.0.0.1', () => {
  console.log(`oidc-provider ${issuer} listening on 127.0.0.1:${port}`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
