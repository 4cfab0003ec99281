// The d1idem console's one script: the overview's live part is fetched
// again every data-refresh-ms milliseconds while the page is visible, and
// put in place of the old one, without reloading the page. It runs no
// value of the ledger: the part is HTML the console escaped, parsed by
// DOMParser (whose scripts never run) and moved into the page, under a
// Content-Security-Policy that forbids inline script.
(function () {
  'use strict';
  var live = document.getElementById('live');
  var status = document.getElementById('refresh-status');
  if (!live || !status) {
    return;
  }
  var every = Number(live.getAttribute('data-refresh-ms'));
  if (!(every > 0)) {
    return;
  }
  var timer = 0;
  var busy = false;

  function clock(d) {
    return d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  }

  function show(text, failed) {
    status.textContent = text;
    status.classList.toggle('failed', failed);
  }

  function schedule() {
    window.clearTimeout(timer);
    timer = window.setTimeout(refresh, every);
  }

  function refresh() {
    if (document.hidden || busy) {
      schedule();
      return;
    }
    busy = true;
    var ctl = new AbortController();
    var abort = window.setTimeout(function () { ctl.abort(); }, Math.max(every, 30000));
    fetch(live.getAttribute('data-src'), {
      credentials: 'same-origin', cache: 'no-store', signal: ctl.signal,
      headers: { 'Accept': 'text/html' }
    }).then(function (res) {
      return res.text().then(function (body) {
        if (!res.ok) {
          throw new Error(body.trim() || ('HTTP ' + res.status));
        }
        var doc = new DOMParser().parseFromString(body, 'text/html');
        var next = doc.getElementById('live-body');
        if (!next) {
          throw new Error('the answer holds no overview');
        }
        var old = document.getElementById('live-body');
        old.replaceWith(document.adoptNode(next));
        show('Refreshed at ' + clock(new Date()) + ', every ' + (every / 1000) + ' s', false);
      });
    }).catch(function (err) {
      show('Refresh failed (' + err.message + '); trying again in ' + (every / 1000) + ' s', true);
    }).finally(function () {
      window.clearTimeout(abort);
      busy = false;
      schedule();
    });
  }

  document.addEventListener('visibilitychange', function () {
    if (!document.hidden) {
      window.clearTimeout(timer);
      refresh();
    }
  });
  schedule();
})();
