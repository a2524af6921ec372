// oncepay console: refreshes the overview's live figures every few seconds, without reloading the
// page. The page works without it; this is its only script.
'use strict';

const PERIOD_MS = 5000;

function refresh(section) {
  // Oncepay-Background: a refresh nobody asked for does not keep an idle session alive.
  const headers = { Accept: 'text/html', 'Oncepay-Background': 'refresh' };
  fetch(section.dataset.live, { credentials: 'same-origin', headers })
    .then((response) => {
      // Signed out or gone: stop, and leave the last figures showing.
      if (!response.ok || response.redirected) {
        return null;
      }
      return response.text();
    })
    .then((html) => {
      if (html === null) {
        return;
      }
      const parsed = new DOMParser().parseFromString(html, 'text/html');
      const fresh = parsed.getElementById('live-figures');
      if (fresh) {
        section.replaceChildren(document.importNode(fresh, true));
      }
      setTimeout(() => refresh(section), PERIOD_MS);
    })
    .catch(() => setTimeout(() => refresh(section), PERIOD_MS * 3));
}

document.addEventListener('DOMContentLoaded', () => {
  const section = document.querySelector('[data-live]');
  if (section) {
    setTimeout(() => refresh(section), PERIOD_MS);
  }
});
