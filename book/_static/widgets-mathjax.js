// ipywidgets typesets widget labels through MathJax 2's API (MathJax.Hub.Queue); the site
// serves MathJax 3, which has no Hub. Bridge the one call it makes, before widgets render
// (they render on `load`; deferred MathJax has run by DOMContentLoaded).
document.addEventListener("DOMContentLoaded", () => {
  const mj = window.MathJax;
  if (!mj || mj.Hub) return;
  mj.Hub = {
    Queue(command) {
      const element = command && command[2];
      if (!element || !mj.startup || !mj.startup.promise) return;
      mj.startup.promise.then(() => mj.typesetPromise([element])).catch(console.warn);
    },
  };
});
