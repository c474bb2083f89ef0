/* Tally: <script defer src="https://TALLY/js/tally.js" data-site="SITE_ID"></script> */
(function () {
  "use strict";
  var w = window, d = document, n = navigator, loc = location;
  var script = d.currentScript;
  if (!script) return;
  function attr(name) { return script.getAttribute("data-" + name); }
  function flag(name) { return script.hasAttribute("data-" + name); }

  var site = attr("site");
  var api = attr("api") || new URL(script.src).origin + "/api/v1/collect";
  var domain = attr("domain");
  var cookieless = flag("cookieless");
  var hashMode = flag("hash");
  var queued = (w.tally && w.tally.q) || [];

  function ignored() {
    try { return localStorage.tally_ignore === "true"; } catch (e) { return false; }
  }
  var silent = !site || n.webdriver || ignored() || (!flag("local") && (
    loc.protocol === "file:" ||
    /^(localhost|127(\.\d+){3}|\[::1\]|0\.0\.0\.0)$|\.localhost$/.test(loc.hostname)));

  var visitor = null;
  if (!cookieless) {
    var found = d.cookie.match(/(?:^|;\s*)tally_vid=((?:[0-9a-f]{4}\.)?[0-9a-f]{32})(?:;|$)/);
    if (found) {
      visitor = found[1];
    } else {
      visitor = (Date.now() / 864e5 + 65536 | 0).toString(16).slice(1) + "." +
        [].map.call(crypto.getRandomValues(new Uint8Array(16)), function (b) {
          return (b + 256).toString(16).slice(1);
        }).join("");
    }
    /* Written on every load: the year runs from the latest visit. */
    d.cookie = "tally_vid=" + visitor + "; Max-Age=31536000; Path=/; SameSite=Lax" +
      (domain ? "; Domain=" + domain : "") + (loc.protocol === "https:" ? "; Secure" : "");
  }

  function send(name, props, uid, hash) {
    if (silent) return;
    var body = { s: site, e: name, u: loc.href, w: w.innerWidth };
    if (d.referrer) body.r = d.referrer;
    if (d.title) body.t = d.title;
    if (n.language) body.l = n.language;
    if (props) body.p = props;
    if (uid) body.uid = uid;
    if (hash) body.uh = hash;
    if (visitor) body.v = visitor;
    body = JSON.stringify(body);
    /* A string body goes as text/plain: a simple request, no CORS preflight.
       keepalive lets it finish when the click that sent it leaves the page. */
    if (w.fetch) {
      fetch(api, { method: "POST", body: body, keepalive: true })
        ["catch"](function () {});
    } else if (n.sendBeacon) {
      n.sendBeacon(api, body);
    }
  }

  var lastPage = null;
  function pageKey() { return hashMode ? loc.href : loc.href.split("#")[0]; }
  function autoPageview() {
    var key = pageKey();
    if (key === lastPage) return;
    lastPage = key;
    send("pageview");
  }

  function tally(command, name, props) {
    if (d.prerendering) {
      queued.push(arguments);
    } else if (command === "pageview") {
      lastPage = pageKey();
      send("pageview");
    } else if (command === "event") {
      send(name, props);
    } else if (command === "identify") {
      send("$identify", null, name, props && props.hash);
    }
  }
  tally.visitorId = function () { return visitor; };
  w.tally = tally;

  function onClick(event) {
    if (event.type === "auxclick" && event.button !== 1) return;
    var target = event.target;
    var tagged = target.closest && target.closest("[data-tally-event]");
    if (tagged) {
      var props = null;
      [].forEach.call(tagged.attributes, function (a) {
        var m = /^data-tally-prop-(.+)/.exec(a.name);
        if (m) (props = props || {})[m[1]] = a.value;
      });
      send(tagged.getAttribute("data-tally-event"), props);
    }
    var link = target.closest && target.closest("a[href]");
    if (!link || !/^https?:$/.test(link.protocol)) return;
    if (flag("outbound") && link.host && link.host !== loc.host) {
      send("Outbound Link", { url: link.href });
    } else if (flag("downloads") &&
        /\.(pdf|xlsx?|docx?|pptx?|txt|rtf|csv|zip|rar|7z|gz|dmg|exe|msi|pkg|iso|apk|mp3|mp4|mov)$/i
          .test(link.pathname)) {
      send("File Download", { url: link.href });
    }
  }

  function start() {
    var history = w.history;
    ["pushState", "replaceState"].forEach(function (method) {
      var call = history[method];
      history[method] = function () {
        var result = call.apply(this, arguments);
        autoPageview();
        return result;
      };
    });
    w.addEventListener("popstate", autoPageview);
    if (hashMode) w.addEventListener("hashchange", autoPageview);
    d.addEventListener("click", onClick, true);
    d.addEventListener("auxclick", onClick, true);
    autoPageview();
    for (var i = 0; i < queued.length; i++) tally.apply(null, queued[i]);
  }

  if (d.prerendering) {
    d.addEventListener("prerenderingchange", start, { once: true });
  } else {
    start();
  }
})();
